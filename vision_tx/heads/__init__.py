"""heads."""
