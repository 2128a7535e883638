"""Diagnosis: turning what the ranks were doing into reports that name the cause."""
