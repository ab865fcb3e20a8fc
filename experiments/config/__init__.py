"""Config glue of the experiments: the structured schema registered in Hydra's ConfigStore
(``groups``), its group configs generated from the library's signatures (``signatures``), and the
typed run configuration the engine reads (``typed``)."""
