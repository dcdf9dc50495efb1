{{/* Names, labels and the values several templates derive from. */}}

{{- define "toposlice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toposlice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "toposlice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "toposlice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: node-plugin or scorer. */}}
{{- define "toposlice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toposlice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "toposlice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "toposlice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "toposlice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The kubelet plugin directory of this driver (dra.sock lives there). */}}
{{- define "toposlice.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.host.kubeletDir) .Values.driverName }}
{{- end }}

{{- define "toposlice.registrarDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.host.kubeletDir) }}
{{- end }}

{{- define "toposlice.httpAddr" -}}
{{- if contains ":" .Values.http.bindAddress }}
{{- printf "[%s]:%d" .Values.http.bindAddress (int .Values.http.port) }}
{{- else }}
{{- printf "%s:%d" .Values.http.bindAddress (int .Values.http.port) }}
{{- end }}
{{- end }}

{{/* The DeviceClass CEL selector; must equal normalize/deviceclasses.py (a test compares). */}}
{{- define "toposlice.deviceClassSelector" -}}
{{- if eq .kind "device" }}
{{- printf "device.driver == %q" .driver }}
{{- else }}
{{- printf "device.driver == %q && device.attributes[%q].type == %q" .driver .driver .kind }}
{{- end }}
{{- end }}

{{/* KubeSchedulerConfiguration that calls the scorer as an extender. */}}
{{- define "toposlice.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: {{ .Values.scorer.scheduler.name }}
extenders:
  - urlPrefix: http://{{ (include "toposlice.fullname" .) }}-scorer.{{ .Release.Namespace }}.svc:{{ .Values.scorer.port }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ .Values.scorer.weight }}
    httpTimeout: 5s
    # Node names only: the scorer's informers hold the Nodes.
    nodeCacheCapable: true
    # The scheduler keeps placing pods when the scorer is down.
    ignorable: true
{{- end }}
