"""Whether this node takes a pod, decided as upstream's admit handlers do."""
