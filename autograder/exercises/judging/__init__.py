"""The judging side: what reads an observation and judges it. Plain Python only: it never imports torch
or anything that runs beside the student's code."""
