{{- define "kvgate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.secretName" -}}
{{- default (printf "%s-secrets" (include "kvgate.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The config file: the user's settings with the listen address and drain timings the pod needs. */}}
{{- define "kvgate.config" -}}
{{- $server := merge (dict "drain_delay" (printf "%ds" (int .Values.drain.delaySeconds)) "drain_timeout" (printf "%ds" (int .Values.drain.timeoutSeconds))) (default (dict) .Values.config.server) -}}
{{- $cfg := merge (dict "listen" (printf "0.0.0.0:%d" (int .Values.service.port)) "server" $server) (omit .Values.config "server" "listen") -}}
{{- toYaml $cfg -}}
{{- end -}}
