"""heads/detr."""
