"""Preflight: refuse bad settings and fingerprint the data before any paid job starts."""
