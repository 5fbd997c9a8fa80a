{{/* Names. */}}
{{- define "asrpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "asrpool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else if contains (include "asrpool.name" .) .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "asrpool.name" .) | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels: include "asrpool.labels" (list . "router") */}}
{{- define "asrpool.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "asrpool.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "asrpool.labels" -}}
{{- $root := index . 0 -}}
{{ include "asrpool.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" }}
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels the operator puts on every server pod (operator/naming.py). */}}
{{- define "asrpool.serverPodLabels" -}}
app.kubernetes.io/name: asrpool-server
app.kubernetes.io/managed-by: asrpool-operator
{{- end }}

{{/* Images: include "asrpool.image" (list . .Values.images.control) */}}
{{- define "asrpool.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/* The namespaces that hold pools: the release namespace first, no duplicates. */}}
{{- define "asrpool.poolNamespaces" -}}
{{- prepend .Values.pools.namespaces .Release.Namespace | uniq | toJson }}
{{- end }}

{{/* Redis: the URL everything dials; never a password in it. Highly available
(redis.sentinel.enabled): every sentinel, by its pod's stable name, then the name they
monitor the primary under (asrpool.common.redis_clients follows its failovers). */}}
{{- define "asrpool.redisUrl" -}}
{{- if and .Values.redis.enabled .Values.redis.sentinel.enabled }}
{{- $sentinels := list }}
{{- range include "asrpool.redisHaHosts" . | fromJsonArray }}
{{- $sentinels = append $sentinels (printf "%s:26379" .) }}
{{- end }}
{{- printf "redis+sentinel://%s/%s/0" (join "," $sentinels) .Values.redis.sentinel.masterName }}
{{- else if .Values.redis.enabled }}
{{- printf "redis://%s-redis.%s.svc.cluster.local:6379/0" (include "asrpool.fullname" .) .Release.Namespace }}
{{- else }}
{{- .Values.redis.external.url }}
{{- end }}
{{- end }}

{{/* Whether the chart's own Redis runs with ACL users (its default user off): a user
for the operator (with ACL rights), one for the routers, and one per pool namespace
that the operator keeps (asrpool.common.redis_acl). */}}
{{- define "asrpool.redisAcl" -}}
{{- if and .Values.redis.enabled .Values.redis.auth.enabled }}true{{ end }}
{{- end }}

{{/* The Secret of the built-in Redis's credentials, in the release namespace only. */}}
{{- define "asrpool.redisCredentialsSecret" -}}
{{- default (printf "%s-redis" (include "asrpool.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* The Secret holding a component's Redis password and its key; empty name: none.
The built-in Redis: the component's own user's; an external one: its one password. */}}
{{- define "asrpool.redisPasswordSecret" -}}
{{- $ctx := index . 0 }}
{{- if include "asrpool.redisAcl" $ctx }}
{{- include "asrpool.redisCredentialsSecret" $ctx }}
{{- else if not $ctx.Values.redis.enabled }}
{{- $ctx.Values.redis.external.passwordSecret.name }}
{{- end }}
{{- end }}
{{- define "asrpool.redisPasswordKey" -}}
{{- $ctx := index . 0 }}
{{- if include "asrpool.redisAcl" $ctx }}{{ printf "%s-password" (index . 1) }}{{ else }}{{ $ctx.Values.redis.external.passwordSecret.key }}{{ end }}
{{- end }}

{{/* Container env for Redis, for a component (list . "router" | "operator"): the URL
(with the component's user on the built-in Redis), and the password by reference. */}}
{{- define "asrpool.redisEnv" -}}
{{- $ctx := index . 0 }}
{{- $url := include "asrpool.redisUrl" $ctx }}
{{- if include "asrpool.redisAcl" $ctx }}
{{- $url = replace "://" (printf "://asrpool-%s@" (index . 1)) $url }}
{{- end }}
- name: ASRPOOL_REDIS_URL
  value: {{ $url | quote }}
{{- with include "asrpool.redisPasswordSecret" . }}
- name: ASRPOOL_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ include "asrpool.redisPasswordKey" $ }}
{{- end }}
{{- end }}

{{/* Secrets. */}}
{{- define "asrpool.podTokenSecretName" -}}
{{- default (printf "%s-pod-token" (include "asrpool.fullname" .)) .Values.auth.podToken.existingSecret }}
{{- end }}

{{- define "asrpool.apiKeysSecretName" -}}
{{- default (printf "%s-api-keys" (include "asrpool.fullname" .)) .Values.auth.apiKeys.existingSecret }}
{{- end }}

{{- define "asrpool.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "asrpool.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Security: non-root, read-only root file system, no privileges. */}}
{{- define "asrpool.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "asrpool.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Scheduling of a component: include "asrpool.scheduling" .Values.router */}}
{{- define "asrpool.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{- define "asrpool.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Who may reach server pods (the operator's NetworkPolicy per pool), as JSON "from"
entries: this release's router pods, and Prometheus (metrics share the server port). */}}
{{- define "asrpool.serverPeers" -}}
{{- $router := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "asrpool.selectorLabels" (list . "router") | fromYaml)) }}
{{- $prometheus := dict "namespaceSelector" .Values.networkPolicy.prometheus.namespaceSelector "podSelector" .Values.networkPolicy.prometheus.podSelector }}
{{- list $router $prometheus | toJson }}
{{- end }}

{{/* Where clients reach the routers (the operator's ASRPOOL_ROUTER_URL): router.url, else
the Ingress's host (wss with its TLS secret), else the router Service in the cluster. */}}
{{- define "asrpool.routerUrl" -}}
{{- $ingress := .Values.router.ingress -}}
{{- if .Values.router.url -}}
{{ .Values.router.url }}
{{- else if and $ingress.enabled $ingress.host -}}
{{ ternary "wss" "ws" (not (empty $ingress.tlsSecretName)) }}://{{ $ingress.host }}
{{- else -}}
ws://{{ include "asrpool.fullname" . }}-router.{{ .Release.Namespace }}.svc:{{ .Values.router.service.port }}
{{- end -}}
{{- end -}}
