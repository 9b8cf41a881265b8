// Builds the pipeline a run asks for: every stage in this process on threads ("local"), or
// this process's one stage of an mpirun launch ("mpi").
#pragma once
#include <memory>
#include <string>

#include "pipeline/pipeline.h"

namespace stateflow {

std::unique_ptr<Pipeline> make_pipeline(const PipelineConfig& cfg, const std::string& transport);
// The rank whose output a run prints (0 with the local transport).
bool is_reporting_rank(const Pipeline& p);

}  // namespace stateflow
