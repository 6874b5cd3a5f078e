"""The zoo's version (also pyproject.toml's), in a module that imports nothing: the lower layers read it
without going through the `zoo` package's facade (zoo.build, zoo.load), which imports the layers above."""

__version__ = "0.2.0"
