"""GPU x model profiles: schema, loading from the shipped ``profiles/`` folder or a path."""

from commitenv.profiles.loader import ProfileError, list_profiles, load_profile
from commitenv.profiles.schema import ClockLevel, EnergyLaw, Profile, TimeLaw

__all__ = ["ClockLevel", "EnergyLaw", "Profile", "ProfileError", "TimeLaw", "list_profiles", "load_profile"]
