"""Bundled trace files (see ATTRIBUTION.md); a package so that installs ship them."""
