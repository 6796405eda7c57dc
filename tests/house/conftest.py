"""The house: docs and records agree with the code, the packages' layers, the markers and CI's skip policy, the
set-up scripts (pip wrapper, system packages), and the background builder of the session's models."""
