"""The class grader (trusted, instructor only): submissions parsed into typed notebooks, each student's cells run in
a sandboxed worker (``sandbox/``), the observations judged with the exercises' checks in this process (which never
imports torch), and the reports, the class report and the nbgrader gradebook written from the results."""
