"""Thin command lines over the runtime's library functions."""
