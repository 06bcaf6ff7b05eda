"""Trace-driven discrete-event simulator; imports the daemons' policy code, never re-implements it."""
