"""The observing side: what runs beside the student's code (in a grading worker, the student's kernel or
a rank's launcher) and may import torch."""
