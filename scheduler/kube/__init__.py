"""Kubernetes I/O of topoplace (the only package that imports ``kubernetes``).

* ``client``: client construction (kubeconfig / ``KUBECONFIG`` / in-cluster) and
  :class:`~scheduler.kube.client.KubeApi`, raw-JSON list / watch / get / binding calls.
* ``watcher``: list+watch reflectors of Nodes, Pods and PodGroups feeding the cache.
* ``binder``: :class:`~scheduler.kube.binder.KubeBinder`, the ``pods/binding`` writer.
* ``recovery``: placements and gang plans rebuilt after a restart, before readiness.
* ``runner``: :func:`~scheduler.kube.runner.build_kube_extender` wires it all for ``serve``.
* ``tls``: uvicorn keyword arguments for HTTPS / mTLS.
"""
