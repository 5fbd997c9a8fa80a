{{/* The built-in Redis: what its one-node form (redis.yaml) and its highly available
form (redis-sentinel.yaml, redis.sentinel.enabled) share, and the names of the latter. */}}

{{/* The users of every Redis node, as redis-server configuration lines whose passwords
the container's shell takes from its environment (never an argument). */}}
{{- define "asrpool.redisUsers" -}}
user default off
user asrpool-operator on >$OPERATOR_PASSWORD ~* &* +@all
user asrpool-router on >$ROUTER_PASSWORD ~asrpool:* resetchannels +@all -@admin -@dangerous
{{- end }}

{{/* A container env entry from the built-in Redis's credentials:
include "asrpool.redisSecretEnv" (list . "OPERATOR_PASSWORD" "operator-password") */}}
{{- define "asrpool.redisSecretEnv" -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "asrpool.redisCredentialsSecret" (index . 0) }}
      key: {{ index . 2 }}
{{- end }}

{{/* The keys of the built-in Redis's credentials Secret: those of the highly available
form's replication and sentinel users too when it runs. */}}
{{- define "asrpool.redisSecretKeys" -}}
{{- $keys := list "operator-password" "router-password" "pods-seed" }}
{{- if .Values.redis.sentinel.enabled }}
{{- $keys = concat $keys (list "replication-password" "sentinel-password") }}
{{- end }}
{{- $keys | toJson }}
{{- end }}

{{/* Highly available: the StatefulSet and its headless Service share this name. A new
name, not FULLNAME-redis: a StatefulSet's serviceName cannot change, so turning the
option on replaces the one-node StatefulSet instead of failing the upgrade. */}}
{{- define "asrpool.redisHaName" -}}
{{- printf "%s-redis-ha" (include "asrpool.fullname" .) }}
{{- end }}

{{/* The stable DNS names of the three Redis pods (each runs Redis and a sentinel), as
a JSON list; they stay the same when a pod is restarted on another IP. */}}
{{- define "asrpool.redisHaHosts" -}}
{{- $name := include "asrpool.redisHaName" . }}
{{- $hosts := list }}
{{- range $i := until 3 }}
{{- $hosts = append $hosts (printf "%s-%d.%s.%s.svc.cluster.local" $name $i $name $.Release.Namespace) }}
{{- end }}
{{- $hosts | toJson }}
{{- end }}

{{/* Shell (POSIX sh: the image's busybox or dash) for the Redis pods' containers:
NODES, the pods' names; as_sentinel, redis-cli as the sentinels' user (its password
from the environment, never an argument) within 3 s; and find_primary, which prints
"HOST PORT" of the primary as the other pods' sentinels name it, or the first pod's
when none answers (a fresh start). This pod's own sentinel is not asked: it may be
starting afresh too. */}}
{{- define "asrpool.redisHaShell" -}}
NODES="{{ include "asrpool.redisHaHosts" . | fromJsonArray | join " " }}"
{{- if .Values.redis.auth.enabled }}
as_sentinel() { REDISCLI_AUTH="$SENTINEL_PASSWORD" timeout 3 redis-cli --user asrpool-sentinel "$@" 2>/dev/null; }
{{- else }}
as_sentinel() { timeout 3 redis-cli "$@" 2>/dev/null; }
{{- end }}
find_primary() {
  for node in $NODES; do
    if [ "$node" != "$ANNOUNCE_HOST" ]; then
      answer=$(timeout 3 redis-cli -h "$node" -p 26379 sentinel get-master-addr-by-name {{ .Values.redis.sentinel.masterName }} 2>/dev/null) || answer=""
      set -- $answer
      if [ $# -eq 2 ] && [ "$2" -eq "$2" ] 2>/dev/null; then
        echo "$1 $2"
        return
      fi
    fi
  done
  echo "${NODES%% *} 6379"
}
{{- end }}
