-- Argo CD health of a ScalingRun, from status.phase and status.conditions (see README, "GitOps").
local hs = {}
if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the scalingrun operator to pick the run up"
  return hs
end
local status = obj.status
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Failed" and condition.status == "True" then
      hs.status = "Degraded"
      hs.message = (condition.reason or "Failed") .. ": " .. (condition.message or "")
      return hs
    end
  end
end
if obj.metadata.generation ~= nil and status.observedGeneration ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Spec change not yet observed by the operator"
  return hs
end
local phase = status.phase
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Training succeeded"
  if status.modelUri ~= nil then hs.message = hs.message .. "; model " .. status.modelUri end
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = "Run failed"
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = "Run suspended (spec.runPolicy.suspend)"
else
  hs.status = "Progressing"
  hs.message = phase
  if phase == "Training" and status.training ~= nil and status.training.epoch ~= nil then
    hs.message = "Training: epoch " .. status.training.epoch .. "/" .. (status.training.maxEpochs or "?")
  end
end
return hs
