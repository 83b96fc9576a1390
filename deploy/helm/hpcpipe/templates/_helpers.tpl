{{/*
The pieces every object of the release shares. They mirror src/hpcpipe/launch/k8s_pod.py and
kubernetes.py (`hpcpipe launch k8s`): tests/unit/launch/test_helm_values.py renders both for the shipped
examples and compares the objects field by field.
*/}}

{{/* The job's name: nameOverride, else the release name, as a DNS label of at most 40 characters. */}}
{{- define "hpcpipe.name" -}}
{{- $name := .Values.nameOverride | default .Release.Name -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "nameOverride %q: use lower-case letters, digits and '-', starting with a letter" $name) -}}
{{- end -}}
{{- if gt (len $name) 40 -}}
{{- fail (printf "the job name %q is longer than 40 characters (pods are named <job>-node-<i>-<j>-<suffix>): set nameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "hpcpipe.configMapName" -}}
{{- include "hpcpipe.name" . }}-config
{{- end -}}

{{/* Labels of the job and its config; user labels win, but for the two that select the pods (the
PodMonitor, `hpcpipe jobs`): refused here too, as `helm install --skip-schema-validation` skips the schema's refusal. */}}
{{- define "hpcpipe.labels" -}}
{{- range $key := list "app.kubernetes.io/name" "app.kubernetes.io/instance" -}}
{{- if hasKey $.Values.labels $key -}}
{{- fail (printf "labels: %q is set by hpcpipe (it selects the job's pods); use another key" $key) -}}
{{- end -}}
{{- end -}}
{{- $labels := dict "app.kubernetes.io/name" "hpcpipe" "app.kubernetes.io/instance" (include "hpcpipe.name" .) "hpcpipe.dev/recipe" .Values.recipe -}}
{{- if .Values.queue -}}
{{- $_ := set $labels "kueue.x-k8s.io/queue-name" .Values.queue -}}
{{- end -}}
{{- if .Values.layout -}}
{{- $_ := set $labels "hpcpipe.dev/layout" .Values.layout -}}
{{- end -}}
{{- toYaml (merge (deepCopy .Values.labels) $labels) -}}
{{- end -}}

{{/* Helm's own bookkeeping labels, on the top-level objects only. */}}
{{- define "hpcpipe.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Pod metadata: the job's labels without Kueue's (Kueue admits the job by its label), and the annotations. */}}
{{- define "hpcpipe.podMetadata" -}}
{{- $labels := dict -}}
{{- range $key, $value := (include "hpcpipe.labels" . | fromYaml) -}}
{{- if not (hasPrefix "kueue.x-k8s.io/" $key) -}}
{{- $_ := set $labels $key $value -}}
{{- end -}}
{{- end -}}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "hpcpipe.image" -}}
{{- $image := .Values.image.repository -}}
{{- if .Values.image.tag -}}{{- $image = printf "%s:%s" $image .Values.image.tag -}}{{- end -}}
{{- if .Values.image.digest -}}{{- $image = printf "%s@%s" $image .Values.image.digest -}}{{- end -}}
{{- $image -}}
{{- end -}}

{{/* Processes per node; never more than the GPUs a node has (launch.k8s refuses it too). */}}
{{- define "hpcpipe.nproc" -}}
{{- $gpus := int (.Values.resources.gpu.count | default 0) -}}
{{- if and $gpus .Values.nprocPerNode (gt (int .Values.nprocPerNode) $gpus) -}}
{{- fail (printf "nprocPerNode %d is more than resources.gpu.count %d: ranks would share a GPU (NCCL refuses: 'Duplicate GPU detected')" (int .Values.nprocPerNode) $gpus) -}}
{{- end -}}
{{- .Values.nprocPerNode | default .Values.resources.gpu.count | default 1 -}}
{{- end -}}

{{- define "hpcpipe.configFile" -}}/etc/hpcpipe/config.yaml{{- end -}}

{{- define "hpcpipe.command" -}}
- {{ .Values.hpcpipeCommand | quote }}
- launch
- agent
- {{ include "hpcpipe.configFile" . }}
- --rdzv-id
- {{ include "hpcpipe.name" . | quote }}
- --grace
- {{ include "hpcpipe.agentGrace" . | quote }}
{{- end -}}

{{/* The agent's wait for its workers after a preemption signal (fault.FaultConfig.agent_grace_s). */}}
{{- define "hpcpipe.agentGrace" -}}
{{ add (int .Values.preemptGraceSeconds) 30 }}
{{- end -}}

{{/* A pod's termination grace: the agent's wait, its SIGKILL of what is left, its exit (pod_grace_s). */}}
{{- define "hpcpipe.podGrace" -}}
{{ add (int .Values.preemptGraceSeconds) 45 }}
{{- end -}}

{{- define "hpcpipe.stageCommand" -}}
- {{ .Values.hpcpipeCommand | quote }}
- data
- stage
- --job
- {{ include "hpcpipe.configFile" . }}
- --if-configured
{{- end -}}

{{/* The training container's environment: unbuffered output, the plain variables (sorted), then the Secret references (sorted). */}}
{{- define "hpcpipe.env" -}}
- name: PYTHONUNBUFFERED
  value: "1"
{{- range $key := keys .Values.env | sortAlpha }}
- name: {{ $key | quote }}
  value: {{ get $.Values.env $key | toString | quote }}
{{- end }}
{{- range $key := keys .Values.secretEnv | sortAlpha }}
{{- $ref := splitn "/" 2 (get $.Values.secretEnv $key) }}
{{- if or (not $ref._0) (not $ref._1) (contains "/" $ref._1) }}
{{- fail (printf "secretEnv.%s: give 'secret-name/key', not a value" $key) }}
{{- end }}
- name: {{ $key | quote }}
  valueFrom:
    secretKeyRef:
      key: {{ $ref._1 | quote }}
      name: {{ $ref._0 | quote }}
{{- end }}
{{- end -}}

{{/* Requests equal limits: the Guaranteed QoS class, and what extended resources require. Empty without any. */}}
{{- define "hpcpipe.resources" -}}
{{- $amounts := dict -}}
{{- if .Values.resources.gpu.count -}}{{- $_ := set $amounts "nvidia.com/gpu" (int64 .Values.resources.gpu.count | toString) -}}{{- end -}}
{{- if .Values.resources.cpu -}}{{- $_ := set $amounts "cpu" (toString .Values.resources.cpu) -}}{{- end -}}
{{- if .Values.resources.memory -}}{{- $_ := set $amounts "memory" (toString .Values.resources.memory) -}}{{- end -}}
{{- range $key, $value := .Values.resources.extra -}}{{- $_ := set $amounts $key (int64 $value | toString) -}}{{- end -}}
{{- if $amounts -}}
limits:
  {{- toYaml $amounts | nindent 2 }}
requests:
  {{- toYaml $amounts | nindent 2 }}
{{- end -}}
{{- end -}}

{{- define "hpcpipe.claimName" -}}
{{- $root := index . 0 -}}{{- $which := index . 1 -}}
{{- $claim := index $root.Values.persistence $which -}}
{{- $claim.existingClaim | default (printf "%s-%s" (include "hpcpipe.name" $root) $which) -}}
{{- end -}}

{{- define "hpcpipe.volumes" -}}
- configMap:
    name: {{ include "hpcpipe.configMapName" . | quote }}
  name: job-config
- emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize | toString | quote }}
  name: dshm
{{- if .Values.persistence.dataset.enabled }}
- name: data
  persistentVolumeClaim:
    claimName: {{ include "hpcpipe.claimName" (list . "dataset") | quote }}
{{- end }}
{{- if .Values.persistence.checkpoints.enabled }}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ include "hpcpipe.claimName" (list . "checkpoints") | quote }}
{{- end }}
{{- if .Values.persistence.runs.enabled }}
- name: runs
  persistentVolumeClaim:
    claimName: {{ include "hpcpipe.claimName" (list . "runs") | quote }}
{{- end }}
{{- if .Values.nodeCache.enabled }}
{{- if eq .Values.nodeCache.type "hostPath" }}
- hostPath:
    path: {{ .Values.nodeCache.hostPath | quote }}
    type: DirectoryOrCreate
  name: node-cache
{{- else }}
- ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          app.kubernetes.io/name: hpcpipe
          app.kubernetes.io/instance: {{ include "hpcpipe.name" . | quote }}
      spec:
        accessModes: [ReadWriteOnce]
        {{- with .Values.nodeCache.storageClass }}
        storageClassName: {{ . | quote }}
        {{- end }}
        resources:
          requests:
            storage: {{ .Values.nodeCache.size | toString | quote }}
  name: node-cache
{{- end }}
{{- end }}
{{- end -}}

{{- define "hpcpipe.mounts" -}}
- mountPath: /etc/hpcpipe
  name: job-config
  readOnly: true
- mountPath: /dev/shm
  name: dshm
{{- if .Values.persistence.dataset.enabled }}
- mountPath: {{ .Values.persistence.dataset.mountPath | quote }}
  name: data
{{- end }}
{{- if .Values.persistence.checkpoints.enabled }}
- mountPath: {{ .Values.persistence.checkpoints.mountPath | quote }}
  name: checkpoints
{{- end }}
{{- if .Values.persistence.runs.enabled }}
- mountPath: {{ .Values.persistence.runs.mountPath | quote }}
  name: runs
{{- end }}
{{- if .Values.nodeCache.enabled }}
- mountPath: {{ .Values.nodeCache.mountPath | quote }}
  name: node-cache
{{- end }}
{{- end -}}

{{/* The init container that stages the dataset onto the node cache (PyTorchJob). */}}
{{- define "hpcpipe.stageContainer" -}}
- command:
    {{- include "hpcpipe.stageCommand" . | nindent 4 }}
  env:
  - name: PYTHONUNBUFFERED
    value: "1"
  image: {{ include "hpcpipe.image" . | quote }}
  name: stage
  {{- with include "hpcpipe.stageResources" . }}
  resources:
    {{- . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "hpcpipe.mounts" . | nindent 4 }}
{{- end -}}

{{/* The node's CPU and memory for the init container too: Guaranteed QoS needs them on every container. */}}
{{- define "hpcpipe.stageResources" -}}
{{- $amounts := dict -}}
{{- if .Values.resources.cpu -}}{{- $_ := set $amounts "cpu" (toString .Values.resources.cpu) -}}{{- end -}}
{{- if .Values.resources.memory -}}{{- $_ := set $amounts "memory" (toString .Values.resources.memory) -}}{{- end -}}
{{- if $amounts -}}
limits:
  {{- toYaml $amounts | nindent 2 }}
requests:
  {{- toYaml $amounts | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* metrics-<local rank>: one exporter port per process (deploy/k8s/podmonitor.yaml keeps these). */}}
{{- define "hpcpipe.metricsPorts" -}}
{{- if not (kindIs "invalid" .Values.metrics.port) }}
{{- $last := add .Values.metrics.port (include "hpcpipe.nproc" .) -1 }}
{{- if gt (int $last) 65535 }}
{{- fail (printf "metrics.port %d: the exporter of local rank %d would listen on %d, above 65535; choose a lower port" (int .Values.metrics.port) (sub (int (include "hpcpipe.nproc" .)) 1) (int $last)) }}
{{- end }}
{{- range $rank := until (int (include "hpcpipe.nproc" .)) }}
- name: metrics-{{ $rank }}
  containerPort: {{ add $.Values.metrics.port $rank }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "hpcpipe.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . | quote }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
- name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The runtime a TrainJob runs on, and the rules launch k8s enforces for it. */}}
{{- define "hpcpipe.runtimeName" -}}
{{- if .Values.runtime.install -}}hpcpipe-torch{{- else -}}{{ .Values.runtime.name }}{{- end -}}
{{- end -}}
