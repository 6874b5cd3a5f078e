"""The running floor: turning an entry into a checkpoint.

    train      the one training loop (every mode: single model, compiled, resumable)
    ensemble   many seeds of one architecture trained together (torch.func vmap)
    builder    construct or train, evaluate, save with graphs and card (`zoo build`)
    sweep      a grid of entry variants
    executor   one way to run many jobs: a local process pool, or Ray (`--backend ray`)

It uses science, storage and export; publishing and the CLI use it.
"""
