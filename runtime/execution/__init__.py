"""Running a step: the step loop, the model runner, CUDA graphs, the sampler, the outputs."""
