"""Transforms: the stateful and cross-cutting pieces of an algorithm (``rljax.transforms.base``
says what a transform is and when its hooks run). Every module of this package is imported
here, so a transform registers itself by existing; none is listed by hand."""
import importlib
import pkgutil

from rljax.transforms.base import (TRANSFORMS, HostRollout, Minibatch, Scored, Transform,
                                   register_transform, resolve_transforms)

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")
