"""expand."""

from __future__ import annotations
