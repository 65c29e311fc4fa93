# SPDX-License-Identifier: Apache-2.0
# Robustness of the C ABI (included by tests/capi/CMakeLists.txt):
#   capi.bad_input.<case>  one bad input through the C ABI per test (docs/abi.md's table)
#   capi.bad_input.list    capi_bad_input --list prints exactly KDN_BAD_INPUT_CASES
#   capi.stress            threads store, retrieve, look up, load, save, put, fetch and
#                          evict at once for KDN_STRESS_SECONDS (20) and check every byte
#   capi.memory            distinct prompts, namespaces and documents for KDN_MEMORY_SECONDS
#                          (15): resident memory stays under a stated bound
#
# Run as a script (cmake -DPROGRAM=<capi_bad_input> -P robustness.cmake), this
# file is the check of capi.bad_input.list.

# The cases of bad_input_test.c, in its order.
set(KDN_BAD_INPUT_CASES
    status_string_unknown
    init_null
    init_size_zero
    init_size_small
    runtime_create_null_out
    runtime_options_size_zero
    runtime_options_size_small
    runtime_options_unknown_tail
    runtime_chunk_tokens_zero
    runtime_capacity_zero
    runtime_tiers_null
    runtime_too_many_tiers
    runtime_worker_threads
    runtime_reserved_nonzero
    tier_size_small
    tier_unknown_tail
    tier_sizes_differ
    tier_kind_unknown
    tier_policy_unknown
    tier_watermarks
    tier_capacity_zero
    tier_disk_without_path
    tier_codec_unknown
    tier_levels_bad
    editor_bad_args
    model_create_null
    model_spec_size
    model_spec_range
    model_spec_enum_unknown
    model_fingerprint_empty
    model_get_null
    lookup_null_args
    namespace_empty
    namespace_too_long
    request_negative_token
    request_target_absurd
    request_zero_tokens
    request_tokens_null
    request_size
    request_sizes_differ
    request_reserved_nonzero
    hash_bytes_too_big
    hash_block_tokens_zero
    hash_chunk_not_multiple
    hash_null
    lookup_result_size
    views_null
    views_none
    view_size
    view_sizes_differ
    views_layers_missing
    views_layers_overlap
    view_num_layers_wrong
    view_dtype_mismatch
    view_dtype_unknown
    view_memory_unknown
    view_layout_unknown
    view_no_memory
    view_negative_stride
    view_aliasing_strides
    view_reserved_nonzero
    view_size_bytes_small
    view_num_tokens_small
    view_layer_elements_small
    paged_null_table
    paged_block_out_of_range
    paged_table_short
    paged_block_size_zero
    paged_with_data
    store_null_args
    retrieve_null_args
    load_async_null_args
    save_async_null_args
    op_null_handle
    op_layer_ready_on_load
    op_wait_layer_on_save
    op_layer_out_of_range
    op_result_size
    kv_result_init_small
    kv_result_required
    kv_result_store_optional
    kv_result_size_small
    kv_result_larger
    knowledge_put_null_args
    knowledge_doc_id_empty
    knowledge_doc_id_too_long
    knowledge_put_bad_tokens
    knowledge_put_replaces_nothing_on_error
    knowledge_unknown_doc
    knowledge_fetch_too_small
    knowledge_fetch_bad_args
    knowledge_list_bad_args
    knowledge_list_size
    knowledge_get_info_bad_args
    knowledge_negative_ttl
    knowledge_null_model
    stats_bad_args
    latency_bad_args
    tier_count_bad_args
    tier_index_out_of_range
    tier_stats_size
    blend_null_callback
    blend_hidden_dim_zero
    blend_bad_options
    blend_bad_segments
    blend_unknown_doc)

if(CMAKE_SCRIPT_MODE_FILE)
  execute_process(COMMAND "${PROGRAM}" --list OUTPUT_VARIABLE listed RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} --list exited with ${rc}")
  endif()
  string(STRIP "${listed}" listed)
  string(REPLACE "\n" ";" listed "${listed}")
  if(NOT listed STREQUAL KDN_BAD_INPUT_CASES)
    set(only_program ${listed})
    list(REMOVE_ITEM only_program ${KDN_BAD_INPUT_CASES})
    set(only_cmake ${KDN_BAD_INPUT_CASES})
    list(REMOVE_ITEM only_cmake ${listed})
    message(FATAL_ERROR "capi_bad_input --list and KDN_BAD_INPUT_CASES (robustness.cmake) differ:\n"
                        "  only in the program: ${only_program}\n"
                        "  only in CMake: ${only_cmake}\n"
                        "  (or the order differs)")
  endif()
  list(LENGTH listed n)
  message(STATUS "capi_bad_input --list: the ${n} cases of robustness.cmake, in order")
  return()
endif()

# Exit code 77: the reference model is missing (a skip).
add_executable(capi_bad_input bad_input_test.c)
set_target_properties(capi_bad_input PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(capi_bad_input PRIVATE ${KDN_CAPI_STRICT})
target_compile_definitions(capi_bad_input PRIVATE KDN_MODELS_DIR="${KDN_MODELS_DIR}")
target_link_libraries(capi_bad_input PRIVATE kdn)
foreach(case IN LISTS KDN_BAD_INPUT_CASES)
  add_test(NAME capi.bad_input.${case} COMMAND capi_bad_input ${case})
  set_tests_properties(capi.bad_input.${case} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)
endforeach()
add_test(NAME capi.bad_input.list
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:capi_bad_input> -P ${CMAKE_CURRENT_LIST_FILE})

# KDN_STRESS_SECONDS (default 20) bounds the run; so does KDN_STRESS_OPS, a
# budget of operations per thread (for slow builds: ThreadSanitizer).
find_package(Threads REQUIRED)
add_executable(capi_stress stress_test.c)
set_target_properties(capi_stress PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(capi_stress PRIVATE ${KDN_CAPI_STRICT})
target_compile_definitions(capi_stress PRIVATE KDN_MODELS_DIR="${KDN_MODELS_DIR}")
target_link_libraries(capi_stress PRIVATE kdn Threads::Threads)
add_test(NAME capi.stress COMMAND capi_stress)
set_tests_properties(capi.stress PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)

# KDN_MEMORY_SECONDS (default 15) bounds the run. Sanitizer builds skip it:
# their shadow memory and quarantine would be measured, not the library.
if(NOT KDN_SANITIZE AND NOT KDN_TSAN)
  add_executable(capi_memory memory_test.c)
  set_target_properties(capi_memory PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(capi_memory PRIVATE ${KDN_CAPI_STRICT})
  target_compile_definitions(capi_memory PRIVATE KDN_MODELS_DIR="${KDN_MODELS_DIR}")
  target_link_libraries(capi_memory PRIVATE kdn)
  add_test(NAME capi.memory COMMAND capi_memory)
  set_tests_properties(capi.memory PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
