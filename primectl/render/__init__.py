"""Render a Plan into per-host bundles of files."""
