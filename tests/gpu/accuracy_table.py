"""Prints the accuracy side by side with SDPA that the GPU tests recorded (pytest --junitxml)."""
import ast
import sys
import xml.etree.ElementTree as ET


def rows(path):
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "ours_err_normwise" in props:
            yield case.get("classname").split(".")[-1] + "::" + case.get("name"), props


def main(path):
    print(f"{'test':72} {'impl':6} {'max err':>9} {'normwise':>9} {'1-ULP share':>11}")
    for name, props in rows(path):
        for impl in ("ours", "flash", "cudnn"):
            if f"{impl}_err_normwise" not in props:
                continue
            err, nrm = ast.literal_eval(props[f"{impl}_err_normwise"])
            share = props.get(f"within_1ulp_of_{impl}")
            share = f"{float(share):.1%}" if share else "-"
            print(f"{name[:72]:72} {impl:6} {err:9.3g} {nrm:9.3g} {share:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
