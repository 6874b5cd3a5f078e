"""The publishing floor: what the zoo shows the world.

    release/      the released checkpoints: plan, build, index, archive, publish
    hub, hub_server, hub_prepare   publishing to a Hub, and `zoo hub serve` (a read-only local Hub)
    hub_git       a new local-hub repo written as git objects in-process (what hub_prepare writes)
    benchmark     the open benchmark: any model scored on a frozen split
    leaderboard   per-task rankings of entries, references and outside models
    report        the papers' report pages
    quickstart    `zoo quickstart`

It uses every floor below it; only the CLI uses it.
"""
