"""Generation v3: the masked-cell model of far-twin canvases, context arms paired by seed
(``plan``), trained through the engine (``run``), the page (``report``)."""
