"""Image generation: a small GAN with a swappable context block on twin-digit canvases, trained
and scored offline (``experiments.generate``, ``experiments.generation.page``)."""
