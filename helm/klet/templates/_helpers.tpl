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

{{/* The kubeconfig klet's services read, or "" for standalone. */}}
{{- define "klet.kubeconfigPath" -}}
{{- if .Values.credentials.existingSecret -}}
/etc/klet/credentials/{{ .Values.credentials.key }}
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
The exec probe of a service: (dict "name" NAME "failureThreshold" N). A Python start on a
loaded node can take seconds, and a check that times out is a failure: hence 15 s.
*/}}
{{- define "klet.probe" -}}
exec:
  command: [klet, healthcheck, {{ .name }}]
timeoutSeconds: 15
periodSeconds: 10
failureThreshold: {{ .failureThreshold | default 3 }}
{{- end -}}

{{/*
Where the services see the host's resolver file (paths.resolvConf), the KubeletConfiguration's
resolvConf: the node's resolver that Default-policy and host-network pods get.
*/}}
{{- define "klet.hostResolvConf" -}}
/etc/klet/host/resolv.conf
{{- end -}}
