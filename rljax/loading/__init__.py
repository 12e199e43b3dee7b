"""Loading models: every role (policy, reference, teacher, judge, reward model, ``rljax rm``'s
start, ``rljax.load``, ``rljax plan``) from one source grammar (``rljax.config.sources``) by one
loader (``rljax.loading.loader``)."""
