"""Analyses and figures that work on any zoo model."""
