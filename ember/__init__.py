"""Ember: a parameter-server system for training recommendation models.

Packages: ``ember.ps_server`` (shards, client), ``ember.trainer`` (embedding
module, caches, DLRM, training), ``ember.kernels`` (native ops), ``ember.cli``
(the ``ember`` command) and ``ember.v1`` (generated wire code).
"""

__version__ = "0.1.0"
