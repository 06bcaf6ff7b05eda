"""Variables the router and the agent put in a job's environment, named once for both."""

from __future__ import annotations

#: In a moved copy's environment: how many times Airlock's moves re-addressed its member
#: before (the router sets it, the agent's Airlock reads it).
READDRESS_COUNT_ENV = "LAMINAR_READDRESS_COUNT"
