{{- define "scalingrun.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "scalingrun.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "scalingrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scalingrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "scalingrun.labels" -}}
{{ include "scalingrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "scalingrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "scalingrun.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* What the operator calls, and nothing more (tests/integration/test_rbac.py records its requests and
compares them with these rules; docs/security.md says why each is needed). One place for the ClusterRole and
the Roles. */}}
{{- define "scalingrun.operatorRules" -}}
# Runs: watched (kopf), read before each reconcile, kopf's annotations and the removal of a user-written
# pinned-spec annotation (patch); status, the started spec pinned in it included (status patch).
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingruns"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingruns/status"]
  verbs: ["patch"]
# Children (and a sweep's points) name their owner with blockOwnerDeletion: where the admission plugin
# OwnerReferencesPermissionEnforcement is on (OpenShift), that needs update on the owner's finalizers.
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingruns/finalizers", "scalingsweeps/finalizers"]
  verbs: ["update"]
# A ScalingSweep's points are ScalingRuns it creates (deleted by GC through their owner references).
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingruns"]
  verbs: ["create"]
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingsweeps"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingsweeps/status"]
  verbs: ["patch"]
# Children: created if absent, read and adopted (patch: owner reference) when found without a controller.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
{{- if .Values.statusServer.enabled }}
# The ConfigMap scalingrun-status (the status endpoint's URL and CA for the runs' pods), by name: watched, so that
# one a tenant changed is written again at once; deleted and made again when a tenant made it immutable.
- apiGroups: [""]
  resources: ["configmaps"]
  resourceNames: ["scalingrun-status"]
  verbs: ["list", "watch", "delete"]
{{- end }}
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# MPIJobs are patched for spec.runPolicy.suspend too, and deleted to resize an elastic run (spec.workers.minReplicas:
# the launcher's mpirun -np is fixed when the MPI operator creates it, so a new size is a new MPIJob).
- apiGroups: ["kubeflow.org"]
  resources: ["mpijobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if not .Values.statusServer.enabled }}
# The storage keys of the Secret a run names (spec.storage.credentialsSecret), to read its manifest and progress.
# Not with the status endpoint: the runs' pods push those, and the operator reads no storage and no run's Secret.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Pods of its children: to tell why a run is stuck (image pull, scheduling, a lost worker); delete: a training pod
# lost with its node (force, grace 0) or stalled, so that the MPI operator makes it anew, and a capacity probe.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
{{- if .Values.elastic.capacityProbes }}
# An elastic run's capacity probes (templates/priorityclass.yaml), only with elastic.capacityProbes: where the
# operator serves named namespaces, only in those (this rule is in their Roles).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["create"]
{{- end }}
# The failed launcher's last log lines, for the Failed condition.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- if .Values.rbac.ownerReferencesPermissionEnforcement }}
# Never called: OwnerReferencesPermissionEnforcement (OpenShift) lets only who may delete an object change its
# ownerReferences, which an adoption does (a child found without a controller; a sweep's point likewise).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["delete"]
- apiGroups: ["scalingrun.dev"]
  resources: ["scalingruns"]
  verbs: ["delete"]
{{- end }}
{{- end }}
