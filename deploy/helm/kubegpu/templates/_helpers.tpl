{{/* The namespace of every namespaced object (values: namespace.name). */}}
{{- define "kubegpu.namespace" -}}
{{- required "namespace.name is required" .Values.namespace.name -}}
{{- end -}}

{{/* Labels on every object: deploy/'s part-of label plus Helm's bookkeeping. */}}
{{- define "kubegpu.labels" -}}
app.kubernetes.io/part-of: kubegpu
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kubegpu.schedulerLabels" -}}
app.kubernetes.io/name: kubegpu-scheduler
{{ include "kubegpu.labels" . }}
{{- end -}}

{{- define "kubegpu.nodeLabels" -}}
app.kubernetes.io/name: kubegpu-node
{{ include "kubegpu.labels" . }}
{{- end -}}

{{/* The Secret holding the signing keys: the user's, or the one this chart creates. */}}
{{- define "kubegpu.keysSecret" -}}
{{- .Values.signingKey.existingSecret | default "kubegpu-allocation-keys" -}}
{{- end -}}

{{- define "kubegpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "kubegpu.leaseName" -}}
{{- required "scheduler.config.leaderElection.leaseName is required" .Values.scheduler.config.leaderElection.leaseName -}}
{{- end -}}

{{/* scheduler.yaml: the values' scheduler.config, with the keys the chart owns (the mounted
     keys directory, the metrics address on metricsPort, the Lease's namespace; with
     scheduler.extender.enabled the extender's address and TLS files) set over it. */}}
{{- define "kubegpu.schedulerConfig" -}}
{{- $config := deepCopy .Values.scheduler.config -}}
{{- $leader := merge (dict "namespace" (include "kubegpu.namespace" .)) ($config.leaderElection | default dict) -}}
{{- $owned := dict "keysDir" "/etc/kubegpu/keys" "metricsAddress" (printf "0.0.0.0:%v" .Values.scheduler.metricsPort) "leaderElection" $leader -}}
{{- $extender := .Values.scheduler.extender | default dict -}}
{{- if $extender.enabled -}}
{{- $_ := set $owned "extenderAddress" (printf "0.0.0.0:%v" $extender.port) -}}
{{- if $extender.tlsSecret -}}
{{- $_ := set $owned "extenderTlsCertFile" "/etc/kubegpu/extender-tls/tls.crt" -}}
{{- $_ := set $owned "extenderTlsPrivateKeyFile" "/etc/kubegpu/extender-tls/tls.key" -}}
{{- end -}}
{{- end -}}
{{- toYaml (merge $owned $config) -}}
{{- end -}}

{{/* Combinations of values that would install and then never work: refused before rendering. */}}
{{- define "kubegpu.validate" -}}
{{- $ns := .Values.namespace -}}
{{- if and .Values.scheduler.hostNetwork $ns.create (ne $ns.podSecurity "privileged") -}}
{{- fail (printf "scheduler.hostNetwork needs namespace.podSecurity=privileged (Pod Security '%s' refuses host-network pods)" $ns.podSecurity) -}}
{{- end -}}
{{- $leader := .Values.scheduler.config.leaderElection | default dict -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (not $leader.enabled) -}}
{{- fail (printf "%v scheduler replicas without scheduler.config.leaderElection.enabled would all bind (devices given twice): enable it or run one replica" .Values.scheduler.replicas) -}}
{{- end -}}
{{- end -}}
