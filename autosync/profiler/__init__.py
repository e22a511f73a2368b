"""Profiles of a model and a network: what the simulator and the cost model read.

This package's top level holds only the data (:class:`Profile`, :class:`ModelProfile`, :class:`NetworkProfile`),
so the cost model and the search import nothing that runs ranks; measuring a profile is
:mod:`autosync.profiler.measure` (``profile_model``, ``profile_network``, ``run_profile``, ``nominal_profile``).
"""
from autosync.profiler.model import ModelProfile, ParamInfo
from autosync.profiler.network import Fit, NetworkProfile
from autosync.profiler.profile import PROFILE_VERSION, Profile, ProfileError, load_profile

__all__ = ["ModelProfile", "ParamInfo", "Fit", "NetworkProfile", "Profile", "ProfileError", "PROFILE_VERSION",
           "load_profile"]
