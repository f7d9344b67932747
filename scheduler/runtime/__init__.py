"""The mutable middle: state between the pure core and the I/O edges.

``cache`` owns the one cluster view (assume / forget / confirm under one lock), ``gangs``
keeps live gang plans and their reservations, ``health_tracker`` keeps health history.
Nothing here does network I/O; the edges (``scheduler/server``, ``scheduler/kube``) call in.
"""
