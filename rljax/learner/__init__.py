"""The compiled update: the train state, the scoring forwards, ``train_step`` (epochs x
minibatches in one jit), packing, and the programs' compilation. Pure functions of arrays and
pytrees: nothing here opens a file, a run directory or a process."""
