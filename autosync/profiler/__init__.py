"""Profiles of a model and a network: what the simulator and the cost model read."""
from autosync.profiler.model import ModelProfile, ParamInfo, profile_model
from autosync.profiler.network import Fit, NetworkProfile, profile_network
from autosync.profiler.profile import PROFILE_VERSION, Profile, ProfileError, load_profile, run_profile

__all__ = ["ModelProfile", "ParamInfo", "profile_model", "Fit", "NetworkProfile", "profile_network", "Profile",
           "ProfileError", "PROFILE_VERSION", "load_profile", "run_profile"]
