"""Transforms: the stateful and cross-cutting pieces of an algorithm (``rljax.transforms.base``
says what a transform is and when its hooks run). Every module of this package is imported the
first time ``TRANSFORMS`` is read (``rljax.registries``), so a transform registers itself by
existing; none is listed by hand."""
from rljax.transforms.base import (TRANSFORMS, HostRollout, Minibatch, Scored, Transform,
                                   register_transform, resolve_transforms)
