"""The class hub: the course on JupyterHub for a class (one server here; Kubernetes material in hub/k8s/).

``python -m hub up`` (``make hub``) sets everything up and starts it; docs/teaching-a-class.md tells the story.
"""
