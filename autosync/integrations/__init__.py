"""Integrations with the frameworks that wrap the model in DDP themselves.

- :mod:`autosync.integrations.lightning`: ``AutosyncDDPStrategy``, a Lightning ``DDPStrategy`` built from a
  strategy file (``pip install 'autosync[lightning]'``).
- Accelerate and the Transformers ``Trainer``: :func:`autosync.register` on the model they wrapped
  (``examples/train_accelerate.py``).

Each imports its framework only when used.
"""
