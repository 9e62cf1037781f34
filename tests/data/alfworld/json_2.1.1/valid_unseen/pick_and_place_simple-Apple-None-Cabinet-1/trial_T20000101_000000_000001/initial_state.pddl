;; Hand-written ALFWorld problem for the adapter's tests (domain: the package's alfred.pddl).
;; A tiny room: an apple on the countertop, a mug on the dining table, a closed cabinet.
;; Task (pick_and_place_simple): put an apple in the cabinet.
;; Names follow ALFRED's mangling (| -> _bar_, - -> _minus_, . -> _dot_) so that ALFWorld's
;; demangler shows them as "apple 1", "cabinet 1", ...
(define (problem plan_tiny_apple_cabinet)
    (:domain alfred)
    (:objects
        agent1 - agent
        AppleType - otype
        MugType - otype
        CabinetType - rtype
        CounterTopType - rtype
        DiningTableType - rtype
        Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40 - object
        Mug_bar__plus_00_dot_80_bar__plus_00_dot_75_bar__minus_01_dot_10 - object
        Cabinet_bar__minus_01_dot_00_bar__plus_00_dot_40_bar__minus_02_dot_00 - receptacle
        CounterTop_bar__minus_01_dot_30_bar__plus_00_dot_90_bar__plus_00_dot_50 - receptacle
        DiningTable_bar__plus_00_dot_90_bar__plus_00_dot_70_bar__minus_01_dot_00 - receptacle
        loc_bar__minus_1_bar_0_bar_2_bar_60 - location
        loc_bar__minus_4_bar__minus_7_bar_2_bar_45 - location
        loc_bar__minus_5_bar_2_bar_3_bar_45 - location
        loc_bar_3_bar__minus_4_bar_1_bar_45 - location
    )
    (:init
        (atLocation agent1 loc_bar__minus_1_bar_0_bar_2_bar_60)
        (receptacleAtLocation Cabinet_bar__minus_01_dot_00_bar__plus_00_dot_40_bar__minus_02_dot_00 loc_bar__minus_4_bar__minus_7_bar_2_bar_45)
        (receptacleAtLocation CounterTop_bar__minus_01_dot_30_bar__plus_00_dot_90_bar__plus_00_dot_50 loc_bar__minus_5_bar_2_bar_3_bar_45)
        (receptacleAtLocation DiningTable_bar__plus_00_dot_90_bar__plus_00_dot_70_bar__minus_01_dot_00 loc_bar_3_bar__minus_4_bar_1_bar_45)
        (receptacleType Cabinet_bar__minus_01_dot_00_bar__plus_00_dot_40_bar__minus_02_dot_00 CabinetType)
        (receptacleType CounterTop_bar__minus_01_dot_30_bar__plus_00_dot_90_bar__plus_00_dot_50 CounterTopType)
        (receptacleType DiningTable_bar__plus_00_dot_90_bar__plus_00_dot_70_bar__minus_01_dot_00 DiningTableType)
        (openable Cabinet_bar__minus_01_dot_00_bar__plus_00_dot_40_bar__minus_02_dot_00)
        (objectType Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40 AppleType)
        (objectType Mug_bar__plus_00_dot_80_bar__plus_00_dot_75_bar__minus_01_dot_10 MugType)
        (pickupable Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40)
        (pickupable Mug_bar__plus_00_dot_80_bar__plus_00_dot_75_bar__minus_01_dot_10)
        (heatable Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40)
        (coolable Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40)
        (inReceptacle Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40 CounterTop_bar__minus_01_dot_30_bar__plus_00_dot_90_bar__plus_00_dot_50)
        (objectAtLocation Apple_bar__minus_01_dot_20_bar__plus_00_dot_95_bar__plus_00_dot_40 loc_bar__minus_5_bar_2_bar_3_bar_45)
        (inReceptacle Mug_bar__plus_00_dot_80_bar__plus_00_dot_75_bar__minus_01_dot_10 DiningTable_bar__plus_00_dot_90_bar__plus_00_dot_70_bar__minus_01_dot_00)
        (objectAtLocation Mug_bar__plus_00_dot_80_bar__plus_00_dot_75_bar__minus_01_dot_10 loc_bar_3_bar__minus_4_bar_1_bar_45)
        (canContain CabinetType AppleType)
        (canContain CabinetType MugType)
        (canContain CounterTopType AppleType)
        (canContain CounterTopType MugType)
        (canContain DiningTableType AppleType)
        (canContain DiningTableType MugType)
    )
    (:goal
        (and
            (exists (?r - receptacle)
                (exists (?o - object)
                    (and
                        (inReceptacle ?o ?r)
                        (objectType ?o AppleType)
                        (receptacleType ?r CabinetType)
                    )
                )
            )
        )
    )
)
