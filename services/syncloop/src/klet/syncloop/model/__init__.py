"""syncloop's pod model, the floor every other syncloop package stands on: reading the pod
spec (podspec), the runtime's view of a pod (runtimepod) and the pod's and its containers'
resource arithmetic (resources). Pure, and importing nothing of syncloop: admission,
probing, containers, volumes and pods all read them, so they live below all of them
instead of inside one (issue 43: inside pods/ and containers/ they tied those packages
into one import cycle).
"""
