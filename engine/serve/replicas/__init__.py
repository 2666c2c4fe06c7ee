"""Replicas of the OpenAI server behind one ingress, on Ray Serve (`eyas-serve replicas=ray`)."""
