{{/* The prefix of every object's name: the release name, plus "-klet" unless it says klet. */}}
{{- define "klet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains "klet" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-klet" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "klet.labels" -}}
app.kubernetes.io/name: klet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" NAME). */}}
{{- define "klet.selectorLabels" -}}
app.kubernetes.io/name: klet
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "klet.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "klet.redisImage" -}}
{{- printf "%s:%s" .Values.redis.image.repository (.Values.redis.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
A service's settings: serviceDefaults with the keys its block under `services` sets
replacing them whole. Returned as YAML: (include "klet.serviceValues" (dict "root" $ "name" NAME) | fromYaml).
*/}}
{{- define "klet.serviceValues" -}}
{{- $merged := deepCopy .root.Values.serviceDefaults -}}
{{- if not (hasKey $merged "enabled") -}}
{{- $_ := set $merged "enabled" true -}}
{{- end -}}
{{- range $k, $v := (index .root.Values.services .name | default dict) -}}
{{- $_ := set $merged $k $v -}}
{{- end -}}
{{- toYaml $merged -}}
{{- end -}}

{{/*
The kubeconfig klet's services read, or "" for standalone. With a bootstrap token it is
the one TLS bootstrap writes, in the certificate directory: the one host directory the
three services that call the apiserver already write, and nothing else mounts.
*/}}
{{- define "klet.kubeconfigPath" -}}
{{- if .Values.credentials.bootstrap.existingSecret -}}
{{ include "klet.certDir" . }}/kubelet.conf
{{- else if .Values.credentials.existingSecret -}}
/etc/klet/credentials/{{ .Values.credentials.key }}
{{- end -}}
{{- end -}}

{{/* Where the bootstrap Secret is mounted; --bootstrap-kubeconfig is its key there. */}}
{{- define "klet.bootstrapDir" -}}
/etc/klet/bootstrap
{{- end -}}

{{/*
--cert-dir: credentials.bootstrap.certDir with a bootstrap token (the node's client key
lives there), else paths.certDir (status-reporter's serving certificate and key). Never
under the root dir, which eviction and syncloop mount: klet.checkCredentials refuses it.
*/}}
{{- define "klet.certDir" -}}
{{- if .Values.credentials.bootstrap.existingSecret -}}
{{- clean .Values.credentials.bootstrap.certDir -}}
{{- else -}}
{{- clean .Values.paths.certDir -}}
{{- end -}}
{{- end -}}

{{/*
Values that contradict each other about the node's credentials, refused by name: a ready
kubeconfig and a bootstrap token at once; a certificate directory that other containers
could read through a host path they mount (it holds the node's private key); certificate
rotation without TLS bootstrap (klet renews only the certificate bootstrap installed in
the certificate directory, and a Secret is read-only); serverTLSBootstrap standalone.
*/}}
{{- define "klet.checkCredentials" -}}
{{- $b := .Values.credentials.bootstrap -}}
{{- if and .Values.credentials.existingSecret $b.existingSecret -}}
{{- fail "credentials.existingSecret and credentials.bootstrap.existingSecret are both set: give one (a Secret with the node's ready kubeconfig, or one with a bootstrap kubeconfig that gets it by TLS bootstrap)" -}}
{{- end -}}
{{- $certDir := include "klet.certDir" . | trimSuffix "/" -}}
{{- $certValue := ternary "credentials.bootstrap.certDir" "paths.certDir" (not (empty $b.existingSecret)) -}}
{{- $certGiven := ternary $b.certDir .Values.paths.certDir (not (empty $b.existingSecret)) -}}
{{- $mounted := dict -}}
{{- range $name := list "rootDir" "podLogsDir" "runtimeSocketDir" "imageFsDir" "cgroupRoot" "runDir" "redisSocketDir" "busDir" -}}
{{- $_ := set $mounted (printf "paths.%s" $name) (index $.Values.paths $name) -}}
{{- end -}}
{{- with .Values.kubeletConfig.staticPodPath -}}
{{- $_ := set $mounted "kubeletConfig.staticPodPath" . -}}
{{- end -}}
{{- if and (not .Values.redis.enabled) (hasPrefix "unix://" .Values.externalRedis.url) -}}
{{- $_ := set $mounted "externalRedis.url's directory" (dir (trimPrefix "unix://" .Values.externalRedis.url)) -}}
{{- end -}}
{{- range $name := keys $mounted | sortAlpha -}}
{{- $other := index $mounted $name | clean | trimSuffix "/" -}}
{{- if or (eq $certDir $other) (hasPrefix (printf "%s/" $other) $certDir) (hasPrefix (printf "%s/" $certDir) $other) -}}
{{- fail (printf "%s %s: give it a directory of its own, neither inside nor around %s (%s): it holds private keys (the serving certificate's; with a bootstrap token the node's client key and kubeconfig), which only the services that use them may mount" $certValue $certGiven $name (index $mounted $name)) -}}
{{- end -}}
{{- end -}}
{{- if and (not $b.existingSecret) (dig "rotateCertificates" false .Values.kubeletConfig) -}}
{{- fail "kubeletConfig.rotateCertificates: needs credentials.bootstrap.existingSecret (TLS bootstrap): klet renews only the client certificate bootstrap keeps in the certificate directory, which the kubeconfig it writes names; a kubeconfig from credentials.existingSecret is a read-only Secret" -}}
{{- end -}}
{{- if and (dig "serverTLSBootstrap" false .Values.kubeletConfig) (not (or .Values.credentials.existingSecret $b.existingSecret)) -}}
{{- fail "kubeletConfig.serverTLSBootstrap: needs credentials (credentials.bootstrap.existingSecret or credentials.existingSecret): the serving certificate is asked for through the certificates API as the node" -}}
{{- end -}}
{{- end -}}

{{/* The Redis URL of the services. */}}
{{- define "klet.redisURL" -}}
{{- if .Values.redis.enabled -}}
unix://{{ .Values.paths.redisSocketDir }}/redis.sock
{{- else -}}
{{- required "externalRedis.url is required when redis.enabled is false" .Values.externalRedis.url -}}
{{- end -}}
{{- end -}}

{{/*
The checksum/config annotation: the rendered KubeletConfiguration and kubeconfig, so that
a change of either rolls every service workload (not Redis, which reads neither).
*/}}
{{- define "klet.configChecksum" -}}
{{- $cfg := include (print .Template.BasePath "/configmap.yaml") . -}}
{{- sha256sum $cfg -}}
{{- end -}}

{{/*
NODE_NAME and NODE_IP: the values, or the host's from the downward API. The env entries
after them may refer to $(NODE_NAME).
*/}}
{{- define "klet.nodeEnv" -}}
- name: NODE_NAME
{{- if .Values.node.name }}
  value: {{ .Values.node.name | quote }}
{{- else }}
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
- name: NODE_IP
{{- if .Values.node.ip }}
  value: {{ .Values.node.ip | quote }}
{{- else }}
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
{{- end }}
{{- end -}}

{{/*
The exec probe of a service: (dict "name" NAME "periodSeconds" S "failureThreshold" N),
every 10 s and 3 failures unless given. A Python start on a loaded node can take seconds,
and a check that times out is a failure: hence 15 s.
*/}}
{{- define "klet.probe" -}}
exec:
  command: [klet, healthcheck, {{ .name }}]
timeoutSeconds: 15
periodSeconds: {{ .periodSeconds | default 10 }}
failureThreshold: {{ .failureThreshold | default 3 }}
{{- end -}}

{{/*
Where the services see the host's resolver file (paths.resolvConf), the KubeletConfiguration's
resolvConf: the node's resolver that Default-policy and host-network pods get.
*/}}
{{- define "klet.hostResolvConf" -}}
/etc/klet/host/resolv.conf
{{- end -}}

{{/*
What each service container gets, the chart's copy of docker-compose.yml's (helm/klet/
README.md has the table; tests/helm checks the rendering against it). `mounts` maps a
host mount (services.yaml defines each) to rw, ro or bidirectional. Every service
also gets the configuration (read-only), the run dir (its lease slots, port files,
gRPC sockets), the bus (its own password file, Redis's socket directory) and an
emptyDir at /tmp for its port file; `apiserver` ones get the node credentials.
*/}}
{{- define "klet.confinement" -}}
# Reads static pod manifests (and a manifest URL) and watches the apiserver: the
# manifests directory alone (kubeletConfig.staticPodPath), not the rest of its parent.
pod-source:
  privileged: false
  hostPID: false
  capabilities: []
  apiserver: true
  mounts:
    static-pod-path: ro
# Runs the pods: mounts their volumes under the root dir (propagated to the host), sets
# cgroups, sysctls and oom_score_adj, and checks hostPath volumes in the host's mount
# namespace through /proc/1/root, which needs the host's PID namespace.
syncloop:
  privileged: true
  hostPID: true
  capabilities: []
  apiserver: true
  mounts:
    root-dir: bidirectional
    pod-logs-dir: rw
    runtime-socket-dir: rw
    cgroup-root: rw
    resolv-conf: ro
# The one on the network (the kubelet API): reads what it reports (pod directories,
# logs, cgroups, the image filesystem's statfs, CRI through its cri-proxy container),
# writes its serving certificate.
status-reporter:
  privileged: false
  hostPID: false
  capabilities: []
  apiserver: true
  criProxy: true
  mounts:
    root-dir: ro
    cert-dir: rw
    pod-logs-dir: ro
    image-fs-dir: ro
    cgroup-root: ro
# Measures the node and the pods; kills through syncloop and frees disk through
# image-gc, both on sockets in the run dir. DAC_READ_SEARCH: it reads every pod's
# emptyDirs and logs whoever owns them; without it a pod hides its disk use from
# ephemeral-storage eviction in a directory only its own user may read.
eviction:
  privileged: false
  hostPID: false
  capabilities: [DAC_READ_SEARCH]
  apiserver: false
  criProxy: true
  mounts:
    root-dir: ro
    pod-logs-dir: ro
    image-fs-dir: ro
    cgroup-root: ro
# Removes images, dead containers and their log directories through CRI.
image-gc:
  privileged: false
  hostPID: false
  capabilities: []
  apiserver: false
  criProxy: true
  mounts:
    pod-logs-dir: rw
    image-fs-dir: ro
{{- end -}}

{{/*
Whether the services get per-node, per-service bus users: the bundled Redis (its init
container makes them), or an external one with externalRedis.perNodeUsers (an operator
provisioned them: external-redis.yaml).
*/}}
{{- define "klet.perServiceUsers" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.perNodeUsers -}}
true
{{- end -}}
{{- end -}}

{{/*
The end of the bundled Redis's bus set-up (its init container): each service's password, from `klet bus-acl`'s
<busDir>/secrets/<node>/<service>, copied to <busDir>/services/<service>/password, the
directory that service alone mounts (a DaemonSet cannot name the node in a hostPath,
and a subPath that does not exist yet would be made a directory by the kubelet). The
copy is renamed into place, so a service never reads half a file.
*/}}
{{- define "klet.distributePasswords" -}}
for s in pod-source syncloop status-reporter eviction image-gc; do
  mkdir -p "$BUS_DIR/services/$s"
  cp "$BUS_DIR/secrets/$NODE_NAME/$s" "$BUS_DIR/services/$s/.password.new"
  mv "$BUS_DIR/services/$s/.password.new" "$BUS_DIR/services/$s/password"
done
{{- end -}}

{{/* The securityContext of a container that needs no privilege: (dict "add" CAPS). */}}
{{- define "klet.confinedContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- with .add }}
  add:
    {{- toYaml . | nindent 4 }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}
