"""The science floor (the ground): what the papers define, with no files and no network.

    tasks/        in-context regression tasks, their token layouts, GD and least-squares baselines, frozen splits
    models/       one file per family: the model, its arch config, its constructions (zoo.science.models.base: the contract)
    constructions the analytic weights an entry names (θ_GD, LSA → RNN, GD-SSM, …)
    registry      the declarative entries (entries/*.toml), validated
    evaluation    metrics against GD and least squares; analysis/ the papers' finer probes
    expected      the papers' numbers and how a measurement is graded against them
    metrics, schema, paths   metric names, the strict pydantic base, safe path names and the cache folder

Nothing here imports a floor above (storage, export, running, publishing, CLI): `tests/test_layers.py` runs
the import-linter contracts of pyproject.toml.
"""
