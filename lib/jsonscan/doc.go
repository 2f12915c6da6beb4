// Package jsonscan reads a few values out of a JSON document without
// decoding the rest: Extract walks the document once and hands back the raw
// bytes of the values at the requested member paths, as subslices of the
// input, and String, Strings, Each and Members decode or iterate those
// values.
//
// It exists for the admission webhook, whose request bodies (up to 7 MiB)
// are built by the API server before schema validation and so may hold
// anything: a status with a quarter of a million conditions, huge
// annotation maps, arrays nested a hundred thousand deep. Decoding such a
// body into map[string]any costs tens of times its size in live memory;
// this package costs none beyond what the caller keeps.
//
// The package must not decode or copy values nobody asked for, allocate
// anything but the results it returns (AppendExtract not even those),
// recurse in proportion to the nesting depth of the document (only to the
// length of the requested paths), or take more than linear time in the
// size of the input. It follows encoding/json where the two could
// disagree: member names are compared after unescaping, exactly and
// case-sensitively, and the last of several members with the same name
// wins.
//
// The package does not validate. Callers check the document with
// json.Valid first; on invalid input the results are unspecified, but no
// function panics, loops forever or reads outside its input.
package jsonscan
