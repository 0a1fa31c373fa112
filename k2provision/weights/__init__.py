"""Model weights: manifests, and the relay that broadcasts them host to host."""
