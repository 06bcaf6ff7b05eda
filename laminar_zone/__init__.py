"""laminar-zone: the zone router (submissions, flow splitting, probing, durable queue)."""
