"""pod-source: reads static-pod manifests (a directory, a URL) and, in cluster mode, this
node's pods from the apiserver, and publishes the merged desired set of pods to the bus
(DESIGN.md, "How a pod flows", step 1).

Layers, lowest first: `validation`, `normalize`, `manifests`, `apipods`, `podconfig`,
`reconcile` are pure; `sources/*` and `publisher` are the adapters (filesystem, HTTP,
apiserver, Redis); `wiring` and `app` assemble and run them.
"""
