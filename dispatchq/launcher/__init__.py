"""Spawning one headless session safely, and the environment every child gets."""
