"""Pure decision core: plain values in, a decision with its reason out."""

from scaler.core.decide import decide
from scaler.core.model import Decision, DecisionState, Observation, Policy

__all__ = ["Decision", "DecisionState", "Observation", "Policy", "decide"]
