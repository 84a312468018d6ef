"""Evidence about an agent or its advice: sequential tests and overfitting statistics."""
