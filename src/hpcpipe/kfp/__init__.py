"""``hpcpipe launch kfp``: the job as a Kubeflow Pipelines v2 pipeline, compiled by the real kfp SDK.

It chains what the rooms below it provide (``hpcpipe run``'s steps from ``pipeline``, the Katib
Experiment from ``hpo``, the train step's job from ``launch``), so it is a package of its own
above them: ``spec.py`` builds the pipeline's JSON spec from a job, ``sdk.py`` finds the
interpreter with kfp and compiles, and ``kfp_compile.py`` is the script that interpreter runs.
"""
