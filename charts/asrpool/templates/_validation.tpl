{{/*
Rules across values that values.schema.json cannot express; each failure names the
values and the fix. Included once, from router-deployment.yaml.
*/}}
{{- define "asrpool.validate" -}}
{{- $router := .Values.router }}
{{- $needed := add $router.preStopSleepSeconds $router.drainGraceSeconds (include "asrpool.routerShutdownSeconds" .) }}
{{- if lt (int $router.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "router.terminationGracePeriodSeconds (%d) must be at least preStopSleepSeconds + drainGraceSeconds + %s (%d): the router needs %s s to stop after its preStop sleep and its drain" (int $router.terminationGracePeriodSeconds) (include "asrpool.routerShutdownSeconds" .) (int $needed) (include "asrpool.routerShutdownSeconds" .)) }}
{{- end }}
{{- if and .Values.redis.sentinel.enabled (not .Values.redis.enabled) }}
{{- fail "redis.sentinel.enabled runs the built-in Redis (redis.enabled) highly available; for your own Redis run by Sentinel, leave it false and give redis.external.url as redis+sentinel://S1:26379,S2:26379,S3:26379/SERVICE/0" }}
{{- end }}
{{- with $router.autoscaling }}
{{- if and .enabled (gt (int .minReplicas) (int .maxReplicas)) }}
{{- fail (printf "router.autoscaling.minReplicas (%d) must not be above maxReplicas (%d)" (int .minReplicas) (int .maxReplicas)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Seconds the router takes to stop after SIGTERM: uvicorn's graceful shutdown bound
in asrpool.router.serving (tests/chart/test_grace.py holds them equal). */}}
{{- define "asrpool.routerShutdownSeconds" -}}5{{- end }}
